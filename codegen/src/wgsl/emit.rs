//! Writes the WGSL source of a verified kernel (parsed and validated by naga afterwards).
//!
//! Every IR value becomes a `let v<N>`. Integer arithmetic on constants is folded here with the
//! IR's wrapping semantics, so the text never holds a WGSL const-expression that overflows
//! (which WGSL rejects). Float results of `add`, `sub`, `mul` and `div` pass through `qf_zero`
//! (see `mod.rs`) so no driver can contract them into a later add or rewrite them algebraically.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

use qforge_ir::{
    BinaryOp, CmpOp, DType, Dim, Kernel, NanMode, Op, ReduceKind, ReduceOrder, Rounding, Scalar,
    ScalarType, Stmt, UnaryOp, Value,
};

use super::helpers::Helper;
use super::{WgslLayout, WgslOptions, BACKEND, WORKGROUP_SIZE};
use crate::error::{Error, Result};

/// The WGSL source of `kernel` (verified) with `layout`, using the software routines that
/// `options` names.
pub(super) fn emit_source(
    kernel: &Kernel,
    layout: &WgslLayout,
    options: WgslOptions,
) -> Result<String> {
    let mut e = Emitter {
        k: kernel,
        layout,
        options,
        body: String::new(),
        indent: 1,
        known: HashMap::new(),
        helpers: BTreeSet::new(),
    };
    for (_, v) in kernel.vars.iter() {
        let line = format!("var l_{}: {};", v.name, ty(v.ty));
        e.line(&line);
    }
    let grid = match kernel.grid {
        Dim::Const(c) => format!("{c}u"),
        Dim::Param(p) => format!("params.p_{}", kernel.params[p].name),
    };
    e.line(&format!(
        "let wi = gid.x + gid.y * (nwg.x * {WORKGROUP_SIZE}u);"
    ));
    e.line(&format!("if wi >= {grid} {{ return; }}"));
    e.block(&kernel.body)?;
    Ok(e.finish())
}

fn ty(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "f32",
        ScalarType::U32 => "u32",
        ScalarType::I32 => "i32",
        ScalarType::Bool => "bool",
    }
}

fn literal(s: Scalar) -> String {
    match s {
        Scalar::F32(b) => format!("bitcast<f32>(0x{b:08x}u)"),
        Scalar::U32(v) => format!("{v}u"),
        Scalar::I32(i32::MIN) => "bitcast<i32>(0x80000000u)".into(),
        Scalar::I32(v) if v < 0 => format!("-{}i", -v),
        Scalar::I32(v) => format!("{v}i"),
        Scalar::Bool(b) => b.to_string(),
    }
}

fn unsupported(op: String) -> Error {
    Error::Unsupported {
        backend: BACKEND,
        op,
    }
}

fn internal(msg: &str) -> Error {
    Error::Backend {
        backend: BACKEND,
        message: format!("internal: {msg}"),
    }
}

/// IR integer semantics on known constants (wrapping, guarded division, masked shifts).
fn fold_int(op: BinaryOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    let t = a.ty();
    let (x, y) = (a.bits(), b.bits());
    let (sx, sy) = (x as i32, y as i32);
    let signed = t == ScalarType::I32;
    let r = match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Div if y == 0 => 0,
        BinaryOp::Div if signed => sx.wrapping_div(sy) as u32,
        BinaryOp::Div => x / y,
        BinaryOp::Rem if y == 0 => 0,
        BinaryOp::Rem if signed => sx.wrapping_rem(sy) as u32,
        BinaryOp::Rem => x % y,
        BinaryOp::Min if signed => sx.min(sy) as u32,
        BinaryOp::Min => x.min(y),
        BinaryOp::Max if signed => sx.max(sy) as u32,
        BinaryOp::Max => x.max(y),
        BinaryOp::And => x & y,
        BinaryOp::Or => x | y,
        BinaryOp::Xor => x ^ y,
        BinaryOp::Shl => x.wrapping_shl(y & 31),
        BinaryOp::Shr if signed => sx.wrapping_shr(y & 31) as u32,
        BinaryOp::Shr => x.wrapping_shr(y & 31),
        BinaryOp::MulHi if signed => ((i64::from(sx) * i64::from(sy)) >> 32) as u32,
        BinaryOp::MulHi => ((u64::from(x) * u64::from(y)) >> 32) as u32,
    };
    Some(Scalar::from_bits(t, r))
}

pub(super) struct Emitter<'k> {
    pub(super) k: &'k Kernel,
    layout: &'k WgslLayout,
    /// Which exact software routines replace WGSL builtins.
    pub(super) options: WgslOptions,
    body: String,
    pub(super) indent: usize,
    /// Values whose WGSL expression is a constant (folded here, never left to WGSL).
    known: HashMap<Value, Scalar>,
    helpers: BTreeSet<Helper>,
}

impl Emitter<'_> {
    pub(super) fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.body.push_str("    ");
        }
        self.body.push_str(s);
        self.body.push('\n');
    }

    pub(super) fn use_helper(&mut self, h: Helper) {
        for d in h.deps() {
            self.helpers.insert(*d);
        }
        self.helpers.insert(h);
    }

    fn finish(self) -> String {
        let mut out = String::new();
        let k = self.k;
        // Tables are `var<private>`, not `const`: indexing a `const` array with a run-time
        // index makes naga's SPIR-V writer spill the whole array to a local at every access,
        // which Mesa lavapipe's LLVM took minutes (bs >= 256) to compile for the 255-entry
        // 8-bit threshold tables. The emitted code never writes a table.
        for (_, t) in k.tables.iter() {
            let items: Vec<String> = t.data.iter().map(|w| format!("0x{w:08x}u")).collect();
            let _ = writeln!(
                out,
                "var<private> t_{}: array<u32, {}> = array<u32, {}>({});",
                t.name,
                t.data.len(),
                t.data.len(),
                items.join(", ")
            );
        }
        out.push_str("struct Params {\n");
        for f in &self.layout.scalars {
            let _ = writeln!(out, "    p_{}: {},", f.name, ty(f.ty));
        }
        out.push_str("    qf_zero: u32,\n}\n");
        for b in &self.layout.buffers {
            let elem = match (b.packed, b.dtype) {
                (true, _) if b.atomic => "atomic<u32>",
                (true, _) => "u32",
                (false, d) => ty(d.value_type()),
            };
            let access = if b.read_only { "read" } else { "read_write" };
            let _ = writeln!(
                out,
                "@group(0) @binding({}) var<storage, {access}> b_{}: array<{elem}>;",
                b.binding, b.name
            );
        }
        let _ = writeln!(
            out,
            "@group(0) @binding({}) var<uniform> params: Params;",
            self.layout.params_binding
        );
        for h in &self.helpers {
            out.push_str(h.source());
        }
        let _ = writeln!(
            out,
            "@compute @workgroup_size({WORKGROUP_SIZE})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{"
        );
        out.push_str(&self.body);
        out.push_str("}\n");
        out
    }

    pub(super) fn block(&mut self, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => self.accumulate(*index, *len, *order, body, accs),
            Stmt::Let(v) => self.let_value(*v),
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => self.store(*buf, *index, *value, *rounding),
            Stmt::Assign { var, value } => {
                let line = format!("l_{} = v{};", self.k.vars[*var].name, value.index());
                self.line(&line);
                Ok(())
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                self.line(&format!("if v{} {{", cond.index()));
                self.indent += 1;
                self.block(then_body)?;
                self.indent -= 1;
                if !else_body.is_empty() {
                    self.line("} else {");
                    self.indent += 1;
                    self.block(else_body)?;
                    self.indent -= 1;
                }
                self.line("}");
                Ok(())
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => {
                let i = format!("v{}", index.index());
                let e = format!("v{}", end.index());
                let next = if *step == 1 {
                    format!("{i} + 1u")
                } else {
                    format!("select({e}, {i} + {step}u, {e} - {i} > {step}u)")
                };
                self.line(&format!(
                    "for (var {i}: u32 = v{}; {i} < {e}; {i} = {next}) {{",
                    start.index()
                ));
                self.indent += 1;
                self.block(body)?;
                self.indent -= 1;
                self.line("}");
                Ok(())
            }
        }
    }

    pub(super) fn v(&self, v: Value) -> String {
        format!("v{}", v.index())
    }

    fn vty(&self, v: Value) -> ScalarType {
        self.k.values[v].ty
    }

    fn let_value(&mut self, v: Value) -> Result<()> {
        let def = &self.k.values[v];
        let t = def.ty;
        let expr = match &def.op {
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => {
                self.reduce(v, *kind, *buf, *start, *len, *order)?;
                format!("r{}", v.index())
            }
            op => self.expr(v, op)?,
        };
        self.line(&format!("let v{}: {} = {expr};", v.index(), ty(t)));
        Ok(())
    }

    /// The WGSL expression of `op` (the definition of `v`).
    fn expr(&mut self, v: Value, op: &Op) -> Result<String> {
        let k = self.k;
        Ok(match op {
            Op::WorkItem => "wi".into(),
            Op::LoopIndex => return Err(internal("loop index outside a for header")),
            Op::Param(p) => format!("params.p_{}", k.params[*p].name),
            Op::Const(c) => {
                self.known.insert(v, *c);
                let finite_or_int = match c {
                    Scalar::F32(b) => b & 0x7f80_0000 != 0x7f80_0000,
                    _ => true,
                };
                if finite_or_int {
                    literal(*c)
                } else {
                    // Non-finite constant expressions are invalid WGSL: make it a runtime value.
                    self.known.remove(&v);
                    format!("bitcast<f32>(0x{:08x}u | params.qf_zero)", c.bits())
                }
            }
            Op::ReadVar(var) => format!("l_{}", k.vars[*var].name),
            Op::Load { buf, index } => {
                let i = self.v(*index);
                self.load(*buf, &i)?
            }
            Op::SearchSorted { .. } => return Err(crate::decompose::undecomposed(super::BACKEND)),
            Op::Lookup { table, index } => {
                let t = &k.tables[*table];
                let last = t.data.len() - 1;
                let i = self.v(*index);
                let raw = format!("t_{}[select({last}u, {i}, {i} < {last}u)]", t.name);
                match t.ty {
                    ScalarType::U32 => raw,
                    ScalarType::F32 | ScalarType::I32 => format!("bitcast<{}>({raw})", ty(t.ty)),
                    ScalarType::Bool => return Err(internal("bool table")),
                }
            }
            Op::Unary(u, a) => self.unary(v, *u, *a),
            Op::Binary(b, x, y) => self.binary(v, *b, *x, *y),
            Op::Fma(a, b, c) => {
                // Constant operands opaque: no identity such as `fma(x, 0, c) = c` applies.
                let [x, y, z] = [a, b, c].map(|o| self.float_operand(*o));
                let f = self.fma_fn();
                format!("{f}({x}, {y}, {z})")
            }
            Op::Cmp(c, x, y) => self.cmp(v, *c, *x, *y),
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                if let Some(Scalar::Bool(c)) = self.known.get(cond).copied() {
                    let chosen = if c { *if_true } else { *if_false };
                    if let Some(s) = self.known.get(&chosen).copied() {
                        self.known.insert(v, s);
                        return Ok(literal(s));
                    }
                }
                format!(
                    "select({}, {}, {})",
                    self.v(*if_false),
                    self.v(*if_true),
                    self.v(*cond)
                )
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => {
                self.use_helper(Helper::FloatToInt);
                let f = match rounding {
                    Rounding::NearestEven => "round",
                    Rounding::TowardZero => "trunc",
                    Rounding::Down => "floor",
                    Rounding::Up => "ceil",
                };
                let x = self.v(*value);
                let name = match to {
                    ScalarType::U32 => "qf_f2u",
                    ScalarType::I32 => "qf_f2i",
                    _ => return Err(internal("float_to_int target")),
                };
                format!("{name}({x}, {f}({x}))")
            }
            Op::IntToFloat { value, rounding } => {
                self.use_helper(Helper::IntToFloat);
                // Modes on the magnitude: 0 nearest even, 1 toward zero, 2 away from zero.
                let (pos, neg) = match rounding {
                    Rounding::NearestEven => (0, 0),
                    Rounding::TowardZero => (1, 1),
                    Rounding::Down => (1, 2),
                    Rounding::Up => (2, 1),
                };
                let x = self.v(*value);
                match self.vty(*value) {
                    ScalarType::U32 => format!("qf_u2f({x}, {pos}u)"),
                    ScalarType::I32 => format!("qf_i2f({x}, {pos}u, {neg}u)"),
                    _ => return Err(internal("int_to_float operand")),
                }
            }
            Op::Bitcast { value, to } => {
                if let Some(s) = self.known.get(value).copied() {
                    let bits = s.bits();
                    if *to != ScalarType::F32 || bits & 0x7f80_0000 != 0x7f80_0000 {
                        let s = Scalar::from_bits(*to, bits);
                        self.known.insert(v, s);
                        return Ok(literal(s));
                    }
                    return Ok(format!("bitcast<f32>(0x{bits:08x}u | params.qf_zero)"));
                }
                format!("bitcast<{}>({})", ty(*to), self.v(*value))
            }
            Op::Reduce { .. } => return Err(internal("reduce in expression position")),
        })
    }

    /// WGSL for loading element `i` (an expression without side effects) of buffer `buf`.
    fn load(&mut self, buf: qforge_ir::ParamId, i: &str) -> Result<String> {
        let layout = self.layout;
        let b = layout
            .buffer(buf.index())
            .ok_or_else(|| internal("load from a non-buffer"))?;
        let name = format!("b_{}", b.name);
        let word = |shift: u32| {
            if b.atomic {
                format!("atomicLoad(&{name}[{i} >> {shift}u])")
            } else {
                format!("{name}[{i} >> {shift}u]")
            }
        };
        Ok(match b.dtype {
            DType::F32 | DType::U32 | DType::I32 => format!("{name}[{i}]"),
            DType::U8 => format!("(({} >> (({i} & 3u) * 8u)) & 0xffu)", word(2)),
            DType::I8 => format!(
                "(bitcast<i32>({} << ((3u - ({i} & 3u)) * 8u)) >> 24u)",
                word(2)
            ),
            DType::F16 => {
                self.use_helper(Helper::F16ToF32);
                format!(
                    "qf_f16_to_f32(({} >> (({i} & 1u) * 16u)) & 0xffffu)",
                    word(1)
                )
            }
            DType::BF16 => format!(
                "bitcast<f32>((({} >> (({i} & 1u) * 16u)) & 0xffffu) << 16u)",
                word(1)
            ),
        })
    }

    /// The WGSL of f32 value `v` as an operand of float arithmetic: opaque when it is a constant
    /// (see [`Emitter::binary`]).
    fn float_operand(&self, v: Value) -> String {
        let x = self.v(v);
        if self.known.contains_key(&v) {
            Self::opaque_f32(&x)
        } else {
            x
        }
    }

    /// `x` made opaque to WGSL's constant evaluation (for operations on constant operands,
    /// which WGSL would evaluate at shader creation and reject on overflow or NaN).
    fn opaque_f32(x: &str) -> String {
        format!("bitcast<f32>(bitcast<u32>({x}) | params.qf_zero)")
    }

    fn unary(&mut self, v: Value, u: UnaryOp, a: Value) -> String {
        let t = self.vty(a);
        let mut x = self.v(a);
        if t == ScalarType::F32 && self.known.contains_key(&a) {
            x = Self::opaque_f32(&x);
        }
        if let Some(s) = self.known.get(&a).copied() {
            if t.is_int() || t == ScalarType::Bool {
                let bits = s.bits();
                let r = match (u, t) {
                    (UnaryOp::Neg, _) => Some(bits.wrapping_neg()),
                    (UnaryOp::Abs, ScalarType::I32) => Some((bits as i32).wrapping_abs() as u32),
                    (UnaryOp::Not, ScalarType::Bool) => Some((bits == 0) as u32),
                    (UnaryOp::Not, _) => Some(!bits),
                    (UnaryOp::Abs | UnaryOp::Sqrt, _) => None,
                };
                if let Some(r) = r {
                    let s = Scalar::from_bits(t, r);
                    self.known.insert(v, s);
                    return literal(s);
                }
            }
        }
        match (u, t) {
            (UnaryOp::Neg, ScalarType::F32) => {
                format!("bitcast<f32>(bitcast<u32>({x}) ^ 0x80000000u)")
            }
            (UnaryOp::Neg, ScalarType::I32) => format!("bitcast<i32>(0u - bitcast<u32>({x}))"),
            (UnaryOp::Neg, _) => format!("(0u - {x})"),
            (UnaryOp::Abs, ScalarType::F32) => {
                format!("bitcast<f32>(bitcast<u32>({x}) & 0x7fffffffu)")
            }
            (UnaryOp::Abs, _) => {
                format!("select({x}, bitcast<i32>(0u - bitcast<u32>({x})), {x} < 0i)")
            }
            (UnaryOp::Sqrt, _) if self.options.soft_sqrt => {
                self.use_helper(Helper::SoftSqrt);
                format!("qf_sqrt({x})")
            }
            (UnaryOp::Sqrt, _) => format!("sqrt({x})"),
            (UnaryOp::Not, ScalarType::Bool) => format!("!{x}"),
            (UnaryOp::Not, _) => format!("~{x}"),
        }
    }

    fn binary(&mut self, v: Value, op: BinaryOp, a: Value, b: Value) -> String {
        let t = self.vty(a);
        let (x, y) = (self.v(a), self.v(b));
        let ka = self.known.get(&a).copied();
        let kb = self.known.get(&b).copied();
        if t.is_int() {
            if let (Some(sa), Some(sb)) = (ka, kb) {
                if let Some(s) = fold_int(op, sa, sb) {
                    self.known.insert(v, s);
                    return literal(s);
                }
            }
        }
        // f32: constant operands, and the second of two equal operands, are made opaque, so that
        // no identity that ignores NaN, infinities or signed zeros (`x + 0 = x`, `x * 0 = 0`,
        // `x - x = 0`, `x / x = 1`) can be applied by the driver.
        let (fx, y) = if t == ScalarType::F32 {
            let fy = if a == b {
                Self::opaque_f32(&y)
            } else {
                self.float_operand(b)
            };
            (self.float_operand(a), fy)
        } else {
            (x.clone(), y)
        };
        let op_str = |s: &str| format!("({fx} {s} {y})");
        let signed = t == ScalarType::I32;
        let zero = if signed { "0i" } else { "0u" };
        let one = if signed { "1i" } else { "1u" };
        // Every f32 result of `+ - * /` leaves the float domain through an OR with a value the
        // compiler cannot know, so no later operation is fused or algebraically rewritten with
        // it (Mesa turns `(x + 1) - 1` into `x` otherwise).
        let opaque = |s: &str| format!("bitcast<f32>(bitcast<u32>({fx} {s} {y}) | params.qf_zero)");
        match (op, t) {
            (BinaryOp::Add, ScalarType::F32) => opaque("+"),
            (BinaryOp::Sub, ScalarType::F32) => opaque("-"),
            (BinaryOp::Mul, ScalarType::F32) => opaque("*"),
            (BinaryOp::Add, _) => op_str("+"),
            (BinaryOp::Sub, _) => op_str("-"),
            (BinaryOp::Mul, _) => op_str("*"),
            (BinaryOp::Div, ScalarType::F32) if self.options.soft_div => {
                self.use_helper(Helper::SoftDiv);
                format!("qf_div({fx}, {y})")
            }
            (BinaryOp::Div, ScalarType::F32) => opaque("/"),
            (BinaryOp::Div | BinaryOp::Rem, _) => {
                let o = if op == BinaryOp::Div { "/" } else { "%" };
                let bad = if signed {
                    format!("{y} == 0i || ({x} == bitcast<i32>(0x80000000u) && {y} == -1i)")
                } else {
                    format!("{y} == 0u")
                };
                format!("select({x} {o} select({y}, {one}, {bad}), {zero}, {y} == {zero})")
            }
            (BinaryOp::Min, ScalarType::F32) => {
                self.use_helper(Helper::FCmp);
                format!("select({x}, {y}, qf_flt({y}, {x}))")
            }
            (BinaryOp::Max, ScalarType::F32) => {
                self.use_helper(Helper::FCmp);
                format!("select({x}, {y}, qf_flt({x}, {y}))")
            }
            (BinaryOp::Min, _) => format!("select({x}, {y}, {y} < {x})"),
            (BinaryOp::Max, _) => format!("select({x}, {y}, {y} > {x})"),
            (BinaryOp::And, ScalarType::Bool) => op_str("&&"),
            (BinaryOp::Or, ScalarType::Bool) => op_str("||"),
            (BinaryOp::Xor, ScalarType::Bool) => op_str("!="),
            (BinaryOp::And, _) => op_str("&"),
            (BinaryOp::Or, _) => op_str("|"),
            (BinaryOp::Xor, _) => op_str("^"),
            (BinaryOp::MulHi, _) => {
                self.use_helper(Helper::MulHi);
                let f = if signed { "qf_imulhi" } else { "qf_umulhi" };
                format!("{f}({x}, {y})")
            }
            (BinaryOp::Shl | BinaryOp::Shr, _) => {
                let o = if op == BinaryOp::Shl { "<<" } else { ">>" };
                let amount = match kb {
                    Some(s) => format!("{}u", s.bits() & 31),
                    None if signed => format!("(bitcast<u32>({y}) & 31u)"),
                    None => format!("({y} & 31u)"),
                };
                format!("({x} {o} {amount})")
            }
        }
    }

    fn cmp(&mut self, v: Value, c: CmpOp, a: Value, b: Value) -> String {
        let t = self.vty(a);
        let (x, y) = (self.v(a), self.v(b));
        if t != ScalarType::F32 {
            if let (Some(sa), Some(sb)) = (self.known.get(&a).copied(), self.known.get(&b).copied())
            {
                let ord = match t {
                    ScalarType::I32 => (sa.bits() as i32).cmp(&(sb.bits() as i32)),
                    _ => sa.bits().cmp(&sb.bits()),
                };
                let r = match c {
                    CmpOp::Eq => ord.is_eq(),
                    CmpOp::Ne => ord.is_ne(),
                    CmpOp::Lt => ord.is_lt(),
                    CmpOp::Le => ord.is_le(),
                    CmpOp::Gt => ord.is_gt(),
                    CmpOp::Ge => ord.is_ge(),
                };
                self.known.insert(v, Scalar::Bool(r));
                return literal(Scalar::Bool(r));
            }
            let o = match c {
                CmpOp::Eq => "==",
                CmpOp::Ne => "!=",
                CmpOp::Lt => "<",
                CmpOp::Le => "<=",
                CmpOp::Gt => ">",
                CmpOp::Ge => ">=",
            };
            return format!("({x} {o} {y})");
        }
        self.use_helper(Helper::FCmp);
        match c {
            CmpOp::Eq => format!("qf_feq({x}, {y})"),
            CmpOp::Ne => format!("!qf_feq({x}, {y})"),
            CmpOp::Lt => format!("qf_flt({x}, {y})"),
            CmpOp::Le => format!("qf_fle({x}, {y})"),
            CmpOp::Gt => format!("qf_flt({y}, {x})"),
            CmpOp::Ge => format!("qf_fle({y}, {x})"),
        }
    }

    fn store(
        &mut self,
        buf: qforge_ir::ParamId,
        index: Value,
        value: Value,
        rounding: Option<Rounding>,
    ) -> Result<()> {
        let b = self
            .layout
            .buffer(buf.index())
            .ok_or_else(|| internal("store to a non-buffer"))?
            .clone();
        let (i, x) = (self.v(index), self.v(value));
        let name = format!("b_{}", b.name);
        let narrow = |r: Option<Rounding>, what: &str| -> Result<()> {
            match r {
                Some(Rounding::NearestEven) => Ok(()),
                Some(r) => Err(unsupported(format!(
                    "{what} store with rounding {}",
                    r.name()
                ))),
                None => Err(internal("narrow float store without rounding")),
            }
        };
        let (bits, per_word_log2, mask) = match b.dtype {
            DType::F32 | DType::U32 | DType::I32 => {
                self.line(&format!("{name}[{i}] = {x};"));
                return Ok(());
            }
            DType::U8 => (x.clone(), 2, "0xffu"),
            DType::I8 => (format!("bitcast<u32>({x})"), 2, "0xffu"),
            DType::F16 => {
                narrow(rounding, "f16")?;
                self.use_helper(Helper::F32ToF16);
                (format!("qf_f32_to_f16({x})"), 1, "0xffffu")
            }
            DType::BF16 => {
                narrow(rounding, "bf16")?;
                self.use_helper(Helper::F32ToBf16);
                (format!("qf_f32_to_bf16({x})"), 1, "0xffffu")
            }
        };
        let width = 32 >> per_word_log2;
        let sub = (1u32 << per_word_log2) - 1;
        let n = value.index();
        self.line("{");
        self.indent += 1;
        self.line(&format!("let sw{n} = {i} >> {per_word_log2}u;"));
        self.line(&format!("let ss{n} = ({i} & {sub}u) * {width}u;"));
        self.line(&format!("atomicAnd(&{name}[sw{n}], ~({mask} << ss{n}));"));
        self.line(&format!(
            "atomicOr(&{name}[sw{n}], ({bits} & {mask}) << ss{n});"
        ));
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    /// Emits the statements computing reduce value `v` into `var r<N>`.
    fn reduce(
        &mut self,
        v: Value,
        kind: ReduceKind,
        buf: qforge_ir::ParamId,
        start: Value,
        len: Value,
        order: ReduceOrder,
    ) -> Result<()> {
        let n = v.index();
        let elem = self.load(buf, &format!("ri{n}"))?;
        let (s, l) = (self.v(start), self.v(len));
        let neg_zero = "bitcast<f32>(0x80000000u)";
        self.line(&format!("var r{n}: f32;"));
        self.line("{");
        self.indent += 1;
        let each = |e: &mut Self, body: &[String]| {
            e.line(&format!(
                "for (var rk{n}: u32 = 0u; rk{n} < {l}; rk{n} = rk{n} + 1u) {{"
            ));
            e.indent += 1;
            e.line(&format!("let ri{n} = {s} + rk{n};"));
            for b in body {
                e.line(b);
            }
            e.indent -= 1;
            e.line("}");
        };
        match (kind, order) {
            (ReduceKind::Sum, ReduceOrder::Sequential) => {
                self.line(&format!("var acc{n}: f32 = {neg_zero};"));
                each(self, &[format!("acc{n} = acc{n} + {elem};")]);
                self.line(&format!("r{n} = acc{n};"));
            }
            (ReduceKind::Sum, ReduceOrder::Strided(ways)) => {
                let m = ways - 1;
                self.line(&format!("var acc{n}: array<f32, {ways}>;"));
                self.line(&format!(
                    "for (var j{n}: u32 = 0u; j{n} < {ways}u; j{n} = j{n} + 1u) {{ acc{n}[j{n}] = {neg_zero}; }}"
                ));
                each(
                    self,
                    &[format!(
                        "acc{n}[rk{n} & {m}u] = acc{n}[rk{n} & {m}u] + {elem};"
                    )],
                );
                let mut w = ways;
                while w > 1 {
                    w /= 2;
                    self.line(&format!(
                        "for (var j{n}: u32 = 0u; j{n} < {w}u; j{n} = j{n} + 1u) {{ acc{n}[j{n}] = acc{n}[j{n}] + acc{n}[j{n} + {w}u]; }}"
                    ));
                }
                self.line(&format!("r{n} = acc{n}[0];"));
            }
            (ReduceKind::AbsMax(nan), ReduceOrder::Sequential | ReduceOrder::Strided(_)) => {
                self.line(&format!("var acc{n}: u32 = 0u;"));
                let mut body = vec![format!("var mag{n} = bitcast<u32>({elem}) & 0x7fffffffu;")];
                match nan {
                    NanMode::Propagate => {}
                    NanMode::Ignore => body.push(format!(
                        "mag{n} = select(mag{n}, 0u, mag{n} > 0x7f800000u);"
                    )),
                }
                body.push(format!("acc{n} = select(acc{n}, mag{n}, mag{n} > acc{n});"));
                each(self, &body);
                self.line(&format!("r{n} = bitcast<f32>(acc{n});"));
            }
        }
        self.indent -= 1;
        self.line("}");
        Ok(())
    }
}
