//! The emitter: SSA names, types, constants, buffers and the statements (masks and while loops).
//! Ops are in `ops.rs`, the exact `fma` and conversions in `exact.rs`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use qforge_ir::{
    Access, DType, Kernel, ParamId, ParamKind, ReduceOrder, ScalarType, Stmt, Value, VarId,
};

use super::{Shapes, BACKEND};
use crate::error::{Error, Result};

/// The element type name of a lane value of type `ty`.
pub(super) fn elt(ty: ScalarType) -> &'static str {
    match ty {
        ScalarType::F32 => "f32",
        ScalarType::U32 => "ui32",
        ScalarType::I32 => "i32",
        ScalarType::Bool => "i1",
    }
}

/// The raw element type a buffer of `dtype` is carried in.
pub(super) fn raw_elt(dtype: DType) -> &'static str {
    match dtype.size_bytes() {
        1 => "ui8",
        2 => "ui16",
        _ => "ui32",
    }
}

/// The literal of the 32-bit pattern `bits` as an element of type `ty`.
pub(super) fn literal(ty: ScalarType, bits: u32) -> String {
    match ty {
        ScalarType::F32 => format!("0x{bits:08X}"),
        ScalarType::U32 => bits.to_string(),
        ScalarType::I32 => (bits as i32).to_string(),
        ScalarType::Bool => (bits != 0).to_string(),
    }
}

/// Lowering state of one module.
pub(super) struct Emitter<'k> {
    pub(super) k: &'k Kernel,
    /// Work items: the leading dimension of every lane value.
    pub(super) g: u32,
    /// Element count per parameter.
    pub(super) elements: Vec<usize>,
    /// The dtype of each buffer parameter (`None` for scalars).
    dtypes: Vec<Option<DType>>,
    /// Constants and parameter broadcasts, emitted at the top of `main` (visible everywhere).
    prologue: String,
    /// The body of `main` after the prologue.
    body: String,
    depth: usize,
    next: usize,
    consts: HashMap<(String, String), String>,
    pub(super) vals: HashMap<Value, String>,
    /// Current value of each local variable (a lane value).
    pub(super) vars: Vec<String>,
    /// Current value of each buffer (raw bits, one spare element at the end).
    pub(super) bufs: Vec<String>,
    /// Each scalar parameter as a lane value of its type.
    pub(super) scalars: Vec<String>,
    /// The lanes executing the current statement (`None`: all).
    pub(super) mask: Option<String>,
}

/// The text of the module for `kernel` at `shapes` (verified and checked by the caller).
pub(super) fn module(k: &Kernel, shapes: &Shapes) -> Result<String> {
    let f = function(k, shapes, "public @main")?;
    Ok(format!(
        "// qforge kernel {} (grid {})\nmodule @{} {{\n{}}}\n",
        k.name,
        shapes.grid,
        module_name(&k.name),
        f.text
    ))
}

/// A kernel lowered to one `func.func` (see the backend's module docs for its signature).
pub(super) struct Function {
    /// The function's text, indented for a module body, ending with a newline.
    pub(super) text: String,
    /// The type of each argument, in parameter order.
    pub(super) args: Vec<String>,
    /// The type of each result: the `Write` and `ReadWrite` buffers, in parameter order.
    pub(super) results: Vec<String>,
}

/// `kernel` at `shapes` as a function named `symbol` (with its visibility, e.g.
/// `"private @shard"`), verified and checked by the caller.
pub(super) fn function(k: &Kernel, shapes: &Shapes, symbol: &str) -> Result<Function> {
    let mut e = Emitter {
        k,
        g: shapes.grid,
        elements: shapes.elements.clone(),
        dtypes: k
            .params
            .iter()
            .map(|(_, p)| match &p.kind {
                ParamKind::Buffer { dtype, .. } => Some(*dtype),
                ParamKind::Scalar(_) => None,
            })
            .collect(),
        prologue: String::new(),
        body: String::new(),
        depth: 2,
        next: 0,
        consts: HashMap::new(),
        vals: HashMap::new(),
        vars: Vec::new(),
        bufs: vec![String::new(); k.params.len()],
        scalars: vec![String::new(); k.params.len()],
        mask: None,
    };
    let mut args = Vec::new();
    let mut results = Vec::new();
    for (i, (_, p)) in k.params.iter().enumerate() {
        let arg = format!("%arg{i}");
        match &p.kind {
            ParamKind::Buffer { dtype, access, .. } => {
                let n = e.elements[i];
                let raw = raw_elt(*dtype);
                args.push(format!("{arg}: tensor<{n}x{raw}>"));
                let spare = e.constant(&format!("tensor<1x{raw}>"), "0");
                let padded = e.fresh();
                e.pro(format!(
                    "{padded} = stablehlo.concatenate {arg}, {spare}, dim = 0 : (tensor<{n}x{raw}>, tensor<1x{raw}>) -> tensor<{}x{raw}>",
                    n + 1
                ));
                e.bufs[i] = padded;
                if *access != Access::Read {
                    results.push((i, format!("tensor<{n}x{raw}>")));
                }
            }
            ParamKind::Scalar(ty) => {
                args.push(format!("{arg}: tensor<ui32>"));
                let typed = if *ty == ScalarType::U32 {
                    arg
                } else {
                    let t = e.fresh();
                    e.pro(format!(
                        "{t} = stablehlo.bitcast_convert {arg} : (tensor<ui32>) -> tensor<{}>",
                        elt(*ty)
                    ));
                    t
                };
                let lanes = e.fresh();
                e.pro(format!(
                    "{lanes} = stablehlo.broadcast_in_dim {typed}, dims = [] : (tensor<{}>) -> {}",
                    elt(*ty),
                    e.lane(*ty)
                ));
                e.scalars[i] = lanes;
            }
        }
    }
    e.vars = k
        .vars
        .iter()
        .map(|(_, v)| e.splat(v.ty, 0))
        .collect::<Vec<_>>();
    e.block(&k.body)?;
    let mut names = Vec::new();
    for (i, ty) in &results {
        let n = e.elements[*i];
        let raw = raw_elt(e.dtype(*i));
        let out = e.fresh();
        e.line(format!(
            "{out} = stablehlo.slice {} [0:{n}] : (tensor<{}x{raw}>) -> {ty}",
            e.bufs[*i],
            n + 1
        ));
        names.push(out);
    }
    let types: Vec<String> = results.into_iter().map(|(_, t)| t).collect();
    let mut text = format!(
        "  func.func {symbol}({}) -> ({}) {{\n",
        args.join(", "),
        types.join(", ")
    );
    text.push_str(&e.prologue);
    text.push_str(&e.body);
    // A kernel without writable buffers returns nothing (`return` takes no `:` then).
    let ret = if names.is_empty() {
        "return".to_string()
    } else {
        format!("return {} : {}", names.join(", "), types.join(", "))
    };
    let _ = writeln!(text, "    {ret}\n  }}");
    let args = args
        .into_iter()
        .map(|a| a.split_once(": ").map_or(a.clone(), |(_, t)| t.to_string()))
        .collect();
    Ok(Function {
        text,
        args,
        results: types,
    })
}

/// A symbol name for the module: the kernel name's identifier characters.
pub(super) fn module_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("qforge_{s}")
}

impl Emitter<'_> {
    /// The dtype of buffer parameter `i` (verified kernels load and store only buffers).
    pub(super) fn dtype(&self, i: usize) -> DType {
        self.dtypes[i].unwrap_or(DType::U32)
    }

    /// The raw tensor type of buffer `i`, with its spare element.
    pub(super) fn buf_type(&self, i: usize) -> String {
        format!(
            "tensor<{}x{}>",
            self.elements[i] + 1,
            raw_elt(self.dtype(i))
        )
    }

    /// A fresh SSA name.
    pub(super) fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    fn pro(&mut self, s: String) {
        let _ = writeln!(self.prologue, "    {s}");
    }

    /// Appends one line of the body at the current nesting.
    pub(super) fn line(&mut self, s: String) {
        for _ in 0..self.depth {
            self.body.push_str("  ");
        }
        self.body.push_str(&s);
        self.body.push('\n');
    }

    /// `tensor<G x elt(ty)>`.
    pub(super) fn lane(&self, ty: ScalarType) -> String {
        format!("tensor<{}x{}>", self.g, elt(ty))
    }

    /// `tensor<G x e>` for an element type name.
    pub(super) fn lane_of(&self, e: &str) -> String {
        format!("tensor<{}x{e}>", self.g)
    }

    /// A constant of type `ty` (full type text) with the splat literal `lit`, defined once in
    /// the prologue.
    pub(super) fn constant(&mut self, ty: &str, lit: &str) -> String {
        let key = (ty.to_string(), lit.to_string());
        if let Some(n) = self.consts.get(&key) {
            return n.clone();
        }
        let n = self.fresh();
        self.pro(format!("{n} = stablehlo.constant dense<{lit}> : {ty}"));
        self.consts.insert(key, n.clone());
        n
    }

    /// A lane value with every lane `bits` of type `ty`.
    pub(super) fn splat(&mut self, ty: ScalarType, bits: u32) -> String {
        let t = self.lane(ty);
        self.constant(&t, &literal(ty, bits))
    }

    /// A lane constant of element type `e` (name) with literal `lit`.
    pub(super) fn splat_of(&mut self, e: &str, lit: &str) -> String {
        let t = self.lane_of(e);
        self.constant(&t, lit)
    }

    /// `r = stablehlo.<op> a : ty`.
    pub(super) fn un(&mut self, op: &str, a: &str, ty: &str) -> String {
        let r = self.fresh();
        self.line(format!("{r} = stablehlo.{op} {a} : {ty}"));
        r
    }

    /// `r = stablehlo.<op> a, b : ty`.
    pub(super) fn bin(&mut self, op: &str, a: &str, b: &str, ty: &str) -> String {
        let r = self.fresh();
        self.line(format!("{r} = stablehlo.{op} {a}, {b} : {ty}"));
        r
    }

    /// A comparison of two values of type `ty` (full type text) with elements `e`, giving `i1`s
    /// of the same shape. `kind` is `FLOAT`, `SIGNED` or `UNSIGNED`.
    pub(super) fn cmp(&mut self, dir: &str, a: &str, b: &str, ty: &str, kind: &str) -> String {
        let r = self.fresh();
        let out = ty.replace(&elt_of(ty), "i1");
        self.line(format!(
            "{r} = stablehlo.compare {dir}, {a}, {b}, {kind} : ({ty}, {ty}) -> {out}"
        ));
        r
    }

    /// `select(c, t, f)` for values of type `ty` (full type text).
    pub(super) fn select(&mut self, c: &str, t: &str, f: &str, ty: &str) -> String {
        let r = self.fresh();
        let cty = ty.replace(&elt_of(ty), "i1");
        self.line(format!(
            "{r} = stablehlo.select {c}, {t}, {f} : ({cty}, {ty}, {ty}) -> {ty}"
        ));
        r
    }

    /// `stablehlo.convert` or `stablehlo.bitcast_convert` (`op`) from `from` to `to`.
    pub(super) fn conv(&mut self, op: &str, a: &str, from: &str, to: &str) -> String {
        let r = self.fresh();
        self.line(format!("{r} = stablehlo.{op} {a} : ({from}) -> {to}"));
        r
    }

    /// `a & b` of two lane masks, either possibly absent (all lanes).
    pub(super) fn and_mask(&mut self, a: Option<&str>, b: &str) -> String {
        match a {
            None => b.to_string(),
            Some(a) => {
                let t = self.lane(ScalarType::Bool);
                self.bin("and", a, b, &t)
            }
        }
    }

    /// Runs the statements of a block under the current mask.
    pub(super) fn block(&mut self, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Let(v) => {
                let r = self.op(*v)?;
                self.vals.insert(*v, r);
            }
            Stmt::Store {
                buf, index, value, ..
            } => {
                let (idx, val) = (self.val(*index), self.val(*value));
                self.store(*buf, &idx, &val);
            }
            Stmt::Assign { var, value } => {
                let v = self.val(*value);
                self.assign(*var, v);
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                let c = self.val(*cond);
                let outer = self.mask.clone();
                let bool_t = self.lane(ScalarType::Bool);
                let then_mask = self.and_mask(outer.as_deref(), &c);
                self.mask = Some(then_mask);
                self.block(then_body)?;
                if !else_body.is_empty() {
                    let not_c = self.un("not", &c, &bool_t);
                    let else_mask = self.and_mask(outer.as_deref(), &not_c);
                    self.mask = Some(else_mask);
                    self.block(else_body)?;
                }
                self.mask = outer;
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => self.for_loop(*index, *start, *end, *step, body)?,
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => self.accumulate(*index, *len, *order, body, accs)?,
        }
        Ok(())
    }

    /// The lowered name of an already emitted value.
    pub(super) fn val(&self, v: Value) -> String {
        self.vals
            .get(&v)
            .cloned()
            .unwrap_or_else(|| "%undefined".into())
    }

    /// `var = value` in the active lanes.
    pub(super) fn assign(&mut self, var: VarId, value: String) {
        let i = var.index();
        let v = match self.mask.clone() {
            None => value,
            Some(m) => {
                let t = self.lane(self.k.vars[var].ty);
                let old = self.vars[i].clone();
                self.select(&m, &value, &old, &t)
            }
        };
        self.vars[i] = v;
    }

    /// Emits a `stablehlo.while` whose carried values are `state` (initial names and types),
    /// then every variable and buffer that `effects` says the body changes. `cond` gets the
    /// state's iteration names and returns the `i1` to continue; `body` gets them (with the
    /// variables and buffers already renamed) and returns the state's next values. Afterwards
    /// the variables and buffers hold the loop's results; the returned names are the state's.
    pub(super) fn while_loop(
        &mut self,
        state: Vec<(String, String)>,
        effects: &Effects,
        cond: impl FnOnce(&mut Self, &[String]) -> Result<String>,
        body: impl FnOnce(&mut Self, &[String]) -> Result<Vec<String>>,
    ) -> Result<Vec<String>> {
        let mut inits: Vec<(String, String)> = state;
        let n_state = inits.len();
        for var in &effects.vars {
            let ty = self.lane(self.k.vars[*var].ty);
            inits.push((self.vars[var.index()].clone(), ty));
        }
        for buf in &effects.bufs {
            let i = buf.index();
            inits.push((self.bufs[i].clone(), self.buf_type(i)));
        }
        let iters: Vec<String> = inits.iter().map(|_| self.fresh()).collect();
        let result = self.fresh();
        let types: Vec<&str> = inits.iter().map(|(_, t)| t.as_str()).collect();
        let types = types.join(", ");
        let bindings: Vec<String> = iters
            .iter()
            .zip(&inits)
            .map(|(it, (init, _))| format!("{it} = {init}"))
            .collect();
        self.line(format!(
            "{result}:{} = stablehlo.while({}) : {types}",
            inits.len(),
            bindings.join(", ")
        ));
        self.line("cond {".into());
        self.depth += 1;
        let c = cond(self, &iters[..n_state])?;
        self.line(format!("stablehlo.return {c} : tensor<i1>"));
        self.depth -= 1;
        self.line("} do {".into());
        self.depth += 1;
        // Inside the body the carried variables and buffers are the iteration arguments.
        let saved_vars = self.vars.clone();
        let saved_bufs = self.bufs.clone();
        for (k, var) in effects.vars.iter().enumerate() {
            self.vars[var.index()] = iters[n_state + k].clone();
        }
        for (k, buf) in effects.bufs.iter().enumerate() {
            self.bufs[buf.index()] = iters[n_state + effects.vars.len() + k].clone();
        }
        let mut next = body(self, &iters[..n_state])?;
        for var in &effects.vars {
            next.push(self.vars[var.index()].clone());
        }
        for buf in &effects.bufs {
            next.push(self.bufs[buf.index()].clone());
        }
        self.line(format!("stablehlo.return {} : {types}", next.join(", ")));
        self.depth -= 1;
        self.line("}".into());
        self.vars = saved_vars;
        self.bufs = saved_bufs;
        for (k, var) in effects.vars.iter().enumerate() {
            self.vars[var.index()] = format!("{result}#{}", n_state + k);
        }
        for (k, buf) in effects.bufs.iter().enumerate() {
            self.bufs[buf.index()] = format!("{result}#{}", n_state + effects.vars.len() + k);
        }
        Ok((0..n_state).map(|k| format!("{result}#{k}")).collect())
    }

    /// `any(mask)` as a `tensor<i1>`.
    pub(super) fn any(&mut self, mask: &str) -> String {
        let f = self.constant("tensor<i1>", "false");
        let r = self.fresh();
        self.line(format!(
            "{r} = stablehlo.reduce({mask} init: {f}) applies stablehlo.or across dimensions = [0] : ({}, tensor<i1>) -> tensor<i1>",
            self.lane(ScalarType::Bool)
        ));
        r
    }

    /// The largest of a `u32` lane value over the active lanes (0 where none), as a
    /// `tensor<ui32>`.
    pub(super) fn max_active(&mut self, v: &str) -> String {
        let u = self.lane(ScalarType::U32);
        let v = match self.mask.clone() {
            None => v.to_string(),
            Some(m) => {
                let zero = self.splat(ScalarType::U32, 0);
                self.select(&m, v, &zero, &u)
            }
        };
        let z = self.constant("tensor<ui32>", "0");
        let r = self.fresh();
        self.line(format!(
            "{r} = stablehlo.reduce({v} init: {z}) applies stablehlo.maximum across dimensions = [0] : ({u}, tensor<ui32>) -> tensor<ui32>"
        ));
        r
    }

    /// A `tensor<ui32>` broadcast to a lane value.
    pub(super) fn broadcast(&mut self, scalar: &str, e: &str) -> String {
        let r = self.fresh();
        self.line(format!(
            "{r} = stablehlo.broadcast_in_dim {scalar}, dims = [] : (tensor<{e}>) -> {}",
            self.lane_of(e)
        ));
        r
    }

    fn for_loop(
        &mut self,
        index: Value,
        start: Value,
        end: Value,
        step: u32,
        body: &[Stmt],
    ) -> Result<()> {
        let (start, end) = (self.val(start), self.val(end));
        let u = self.lane(ScalarType::U32);
        let b = self.lane(ScalarType::Bool);
        let begins = self.cmp("LT", &start, &end, &u, "UNSIGNED");
        let active = self.and_mask(self.mask.clone().as_deref(), &begins);
        let effects = Effects::of(body);
        let outer = self.mask.clone();
        let step_v = self.splat(ScalarType::U32, step.max(1));
        self.while_loop(
            vec![(start, u.clone()), (active, b.clone())],
            &effects,
            |e, s| Ok(e.any(&s[1])),
            |e, s| {
                let (i, act) = (s[0].clone(), s[1].clone());
                e.vals.insert(index, i.clone());
                e.mask = Some(act.clone());
                e.block(body)?;
                let next = e.bin("add", &i, &step_v, &u);
                let no_wrap = e.cmp("GT", &next, &i, &u, "UNSIGNED");
                let below = e.cmp("LT", &next, &end, &u, "UNSIGNED");
                let cont = e.bin("and", &no_wrap, &below, &b);
                let act2 = e.bin("and", &act, &cont, &b);
                Ok(vec![next, act2])
            },
        )?;
        self.mask = outer;
        Ok(())
    }

    fn accumulate(
        &mut self,
        index: Value,
        len: Value,
        order: ReduceOrder,
        body: &[Stmt],
        accs: &[qforge_ir::Accum],
    ) -> Result<()> {
        let len = self.val(len);
        let limit = self.max_active(&len);
        let ways = order.ways().max(1);
        let mut state = vec![(self.constant("tensor<ui32>", "0"), "tensor<ui32>".into())];
        let pty = self.partials_type(ways);
        for _ in accs {
            let neg_zero = self.constant(&pty, "-0.0");
            state.push((neg_zero, pty.clone()));
        }
        let outer = self.mask.clone();
        let u = self.lane(ScalarType::U32);
        let results = self.while_loop(
            state,
            &Effects::default(),
            |e, s| Ok(e.cmp("LT", &s[0], &limit, "tensor<ui32>", "UNSIGNED")),
            |e, s| {
                let i = e.broadcast(&s[0], "ui32");
                e.vals.insert(index, i.clone());
                let inside = e.cmp("LT", &i, &len, &u, "UNSIGNED");
                let m = e.and_mask(outer.as_deref(), &inside);
                e.mask = Some(m.clone());
                e.block(body)?;
                let mut next = vec![e.counter_next(&s[0])];
                for (t, acc) in accs.iter().enumerate() {
                    let (a, b) = (e.val(acc.a), e.val(acc.b));
                    let p = e.partial_get(&s[1 + t], &s[0], ways);
                    let f = e.fma(&a, &b, &p);
                    let f32t = e.lane(ScalarType::F32);
                    let kept = e.select(&m, &f, &p, &f32t);
                    next.push(e.partial_set(&s[1 + t], &kept, &s[0], ways));
                }
                Ok(next)
            },
        )?;
        self.mask = outer;
        for (t, acc) in accs.iter().enumerate() {
            let total = self.tree(&results[1 + t], ways, "add");
            self.assign(acc.var, total);
        }
        Ok(())
    }

    /// The type of `ways` partials per lane: `tensor<G x f32>` for one, else
    /// `tensor<G x ways x f32>`.
    pub(super) fn partials_type(&self, ways: u32) -> String {
        if ways == 1 {
            self.lane(ScalarType::F32)
        } else {
            format!("tensor<{}x{ways}xf32>", self.g)
        }
    }

    /// `counter + 1` of a `tensor<ui32>` counter.
    pub(super) fn counter_next(&mut self, c: &str) -> String {
        let one = self.constant("tensor<ui32>", "1");
        self.bin("add", c, &one, "tensor<ui32>")
    }

    /// Partial `counter % ways` of every lane.
    pub(super) fn partial_get(&mut self, p: &str, counter: &str, ways: u32) -> String {
        if ways == 1 {
            return p.to_string();
        }
        let col = self.column(counter, ways);
        let zero = self.constant("tensor<i64>", "0");
        let s = self.fresh();
        self.line(format!(
            "{s} = stablehlo.dynamic_slice {p}, {zero}, {col}, sizes = [{}, 1] : ({}, tensor<i64>, tensor<i64>) -> tensor<{}x1xf32>",
            self.g,
            self.partials_type(ways),
            self.g
        ));
        let r = self.fresh();
        self.line(format!(
            "{r} = stablehlo.reshape {s} : (tensor<{}x1xf32>) -> {}",
            self.g,
            self.lane(ScalarType::F32)
        ));
        r
    }

    /// The partials `p` with partial `counter % ways` of every lane replaced by `v`.
    pub(super) fn partial_set(&mut self, p: &str, v: &str, counter: &str, ways: u32) -> String {
        if ways == 1 {
            return v.to_string();
        }
        let col = self.column(counter, ways);
        let zero = self.constant("tensor<i64>", "0");
        let r2 = self.fresh();
        self.line(format!(
            "{r2} = stablehlo.reshape {v} : ({}) -> tensor<{}x1xf32>",
            self.lane(ScalarType::F32),
            self.g
        ));
        let r = self.fresh();
        let pt = self.partials_type(ways);
        self.line(format!(
            "{r} = stablehlo.dynamic_update_slice {p}, {r2}, {zero}, {col} : ({pt}, tensor<{}x1xf32>, tensor<i64>, tensor<i64>) -> {pt}",
            self.g
        ));
        r
    }

    /// `counter % ways` as a `tensor<i64>`.
    fn column(&mut self, counter: &str, ways: u32) -> String {
        let w = self.constant("tensor<ui32>", &ways.to_string());
        let m = self.bin("remainder", counter, &w, "tensor<ui32>");
        self.conv("convert", &m, "tensor<ui32>", "tensor<i64>")
    }

    /// The halving tree over `ways` partials per lane with `op` (`add`), as a lane value.
    pub(super) fn tree(&mut self, p: &str, ways: u32, op: &str) -> String {
        let g = self.g;
        let mut cur = p.to_string();
        let mut w = ways;
        while w > 1 {
            let h = w / 2;
            let from = format!("tensor<{g}x{w}xf32>");
            let to = format!("tensor<{g}x{h}xf32>");
            let lo = self.fresh();
            self.line(format!(
                "{lo} = stablehlo.slice {cur} [0:{g}, 0:{h}] : ({from}) -> {to}"
            ));
            let hi = self.fresh();
            self.line(format!(
                "{hi} = stablehlo.slice {cur} [0:{g}, {h}:{w}] : ({from}) -> {to}"
            ));
            cur = self.bin(op, &lo, &hi, &to);
            w = h;
        }
        if ways > 1 {
            let r = self.fresh();
            self.line(format!(
                "{r} = stablehlo.reshape {cur} : (tensor<{g}x1xf32>) -> {}",
                self.lane(ScalarType::F32)
            ));
            cur = r;
        }
        cur
    }

    /// An error for an op this backend does not lower.
    pub(super) fn unsupported(&self, what: String) -> Error {
        Error::Unsupported {
            backend: BACKEND,
            op: format!("{} in {}", what, self.k.name),
        }
    }
}

/// The element type name of a tensor type's text (`tensor<4x2xf32>` -> `f32`).
fn elt_of(ty: &str) -> String {
    let inner = ty.trim_start_matches("tensor<").trim_end_matches('>');
    inner.rsplit('x').next().unwrap_or(inner).to_string()
}

/// The variables a block assigns and the buffers it stores to, at any depth.
#[derive(Clone, Debug, Default)]
pub(super) struct Effects {
    pub(super) vars: BTreeSet<VarId>,
    pub(super) bufs: BTreeSet<ParamId>,
}

impl Effects {
    pub(super) fn of(stmts: &[Stmt]) -> Effects {
        let mut e = Effects::default();
        e.add(stmts);
        e
    }

    fn add(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            match s {
                Stmt::Let(_) => {}
                Stmt::Store { buf, .. } => {
                    self.bufs.insert(*buf);
                }
                Stmt::Assign { var, .. } => {
                    self.vars.insert(*var);
                }
                Stmt::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    self.add(then_body);
                    self.add(else_body);
                }
                Stmt::For { body, .. } => self.add(body),
                Stmt::Accumulate { body, accs, .. } => {
                    self.add(body);
                    self.vars.extend(accs.iter().map(|a| a.var));
                }
            }
        }
    }
}
