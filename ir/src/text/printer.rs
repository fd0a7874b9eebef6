//! The printer of the text form (see the grammar in [`super`]).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::is_ident;
use crate::kernel::{Dim, Kernel, ParamKind, Stmt, Value, ValueDef};
use crate::ops::{NanMode, Op, ReduceKind, ReduceOrder};
use crate::types::{Scalar, ScalarType};

/// Table elements per printed row: `f32` rows carry a comment with the decimal values.
const F32_PER_ROW: usize = 4;
const INT_PER_ROW: usize = 8;

pub(super) fn print(k: &Kernel) -> String {
    let p = Printer::new(k);
    let mut out = String::new();
    p.header(&mut out);
    out.push_str("{\n");
    p.block(&mut out, &k.body, 1);
    out.push_str("}\n");
    p.unused(&mut out);
    out
}

/// A name as written in a declaration: bare when it is an identifier, quoted otherwise.
pub(super) fn name_text(name: &str) -> String {
    if is_ident(name) {
        return name.to_string();
    }
    let mut s = String::from("\"");
    for c in name.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            c if c.is_control() => {
                let _ = write!(s, "\\u{{{:x}}}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// How each handle of one namespace is referred to: its name when that is unique, else `#N`.
fn reference_table<'a>(names: impl Iterator<Item = &'a str>) -> Vec<Option<String>> {
    let names: Vec<&str> = names.collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for n in &names {
        *count.entry(n).or_default() += 1;
    }
    names
        .iter()
        .map(|n| (count.get(n) == Some(&1)).then(|| name_text(n)))
        .collect()
}

fn reference(refs: &[Option<String>], index: usize) -> String {
    match refs.get(index) {
        Some(Some(name)) => name.clone(),
        _ => format!("#{index}"),
    }
}

/// `sequential` or `strided N`.
fn order_text(order: ReduceOrder) -> String {
    match order {
        ReduceOrder::Sequential => "sequential".to_string(),
        ReduceOrder::Strided(w) => format!("strided {w}"),
    }
}

fn f32_comment(bits: u32) -> String {
    format!("{:?}", f32::from_bits(bits))
}

struct Printer<'k> {
    k: &'k Kernel,
    params: Vec<Option<String>>,
    tables: Vec<Option<String>>,
    vars: Vec<Option<String>>,
    /// Values defined by a `Let` somewhere in the body.
    let_defined: HashSet<usize>,
    /// Values named by a `for` header.
    for_indices: HashSet<usize>,
}

impl<'k> Printer<'k> {
    fn new(k: &'k Kernel) -> Self {
        let mut p = Printer {
            k,
            params: reference_table(k.params.iter().map(|(_, p)| p.name.as_str())),
            tables: reference_table(k.tables.iter().map(|(_, t)| t.name.as_str())),
            vars: reference_table(k.vars.iter().map(|(_, v)| v.name.as_str())),
            let_defined: HashSet::new(),
            for_indices: HashSet::new(),
        };
        p.scan(&k.body);
        p
    }

    fn scan(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            match s {
                Stmt::Let(v) => {
                    self.let_defined.insert(v.index());
                }
                Stmt::Store { .. } | Stmt::Assign { .. } => {}
                Stmt::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    self.scan(then_body);
                    self.scan(else_body);
                }
                Stmt::For { index, body, .. } | Stmt::Accumulate { index, body, .. } => {
                    self.for_indices.insert(index.index());
                    self.scan(body);
                }
            }
        }
    }

    fn param(&self, h: crate::kernel::ParamId) -> String {
        reference(&self.params, h.index())
    }

    fn dim(&self, d: &Dim) -> String {
        match d {
            Dim::Const(c) => c.to_string(),
            Dim::Param(p) => self.param(*p),
        }
    }

    fn header(&self, out: &mut String) {
        let k = self.k;
        let params: Vec<String> = k
            .params
            .iter()
            .map(|(_, p)| match &p.kind {
                ParamKind::Scalar(t) => format!("{}: {t}", name_text(&p.name)),
                ParamKind::Buffer {
                    dtype,
                    shape,
                    access,
                } => {
                    let dims: Vec<String> = shape.iter().map(|d| self.dim(d)).collect();
                    format!(
                        "{}: {dtype}[{}] {}",
                        name_text(&p.name),
                        dims.join(", "),
                        access.name()
                    )
                }
            })
            .collect();
        let _ = writeln!(out, "kernel {}({})", name_text(&k.name), params.join(", "));
        let _ = writeln!(out, "grid {}", self.dim(&k.grid));
        // The arena length is inferred as 1 + the highest value number defined or named by a
        // `for`; say it only when that inference would be wrong.
        let len = k.values.len();
        let inferred = self
            .for_indices
            .iter()
            .map(|i| i + 1)
            .max()
            .unwrap_or(0)
            .max(len);
        if inferred != len {
            let _ = writeln!(out, "values {len}");
        }
        for (_, t) in k.tables.iter() {
            let _ = write!(
                out,
                "table {}: {}[{}] = [",
                name_text(&t.name),
                t.ty,
                t.data.len()
            );
            let is_f32 = t.ty == ScalarType::F32;
            let per_row = if is_f32 { F32_PER_ROW } else { INT_PER_ROW };
            let rows = t.data.chunks(per_row).count();
            if rows > 0 {
                out.push('\n');
            }
            for (r, row) in t.data.chunks(per_row).enumerate() {
                let items: Vec<String> = row.iter().map(|b| table_elem(t.ty, *b)).collect();
                let comma = if r + 1 < rows { "," } else { "" };
                let _ = write!(out, "  {}{comma}", items.join(", "));
                if is_f32 {
                    let dec: Vec<String> = row.iter().map(|b| f32_comment(*b)).collect();
                    let _ = write!(out, "  // {}", dec.join(", "));
                }
                out.push('\n');
            }
            out.push_str("]\n");
        }
        for (_, v) in k.vars.iter() {
            let _ = writeln!(out, "var {}: {}", name_text(&v.name), v.ty);
        }
    }
}

impl Printer<'_> {
    fn block(&self, out: &mut String, stmts: &[Stmt], depth: usize) {
        for s in stmts {
            self.stmt(out, s, depth);
        }
    }

    fn stmt(&self, out: &mut String, s: &Stmt, depth: usize) {
        let pad = "  ".repeat(depth);
        match s {
            Stmt::Let(v) => match self.k.values.try_get(*v) {
                Some(def) => {
                    out.push_str(&pad);
                    self.def(out, *v, def);
                }
                None => {
                    let _ = writeln!(out, "{pad}let %{}", v.index());
                }
            },
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => {
                let _ = write!(
                    out,
                    "{pad}store {}[%{}] = %{}",
                    self.param(*buf),
                    index.index(),
                    value.index()
                );
                if let Some(r) = rounding {
                    let _ = write!(out, " {}", r.name());
                }
                out.push('\n');
            }
            Stmt::Assign { var, value } => {
                let _ = writeln!(
                    out,
                    "{pad}assign {} = %{}",
                    reference(&self.vars, var.index()),
                    value.index()
                );
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                let _ = writeln!(out, "{pad}if %{} {{", cond.index());
                self.block(out, then_body, depth + 1);
                if else_body.is_empty() {
                    let _ = writeln!(out, "{pad}}}");
                } else {
                    let _ = writeln!(out, "{pad}}} else {{");
                    self.block(out, else_body, depth + 1);
                    let _ = writeln!(out, "{pad}}}");
                }
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}for %{} in %{}..%{} step {step} {{",
                    index.index(),
                    start.index(),
                    end.index()
                );
                self.block(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}accumulate %{} len %{} {} {{",
                    index.index(),
                    len.index(),
                    order_text(*order)
                );
                self.block(out, body, depth + 1);
                let accs: Vec<String> = accs
                    .iter()
                    .map(|a| {
                        format!(
                            "{}(%{}, %{})",
                            reference(&self.vars, a.var.index()),
                            a.a.index(),
                            a.b.index()
                        )
                    })
                    .collect();
                let _ = writeln!(out, "{pad}}} into {}", accs.join(", "));
            }
        }
    }

    /// `%N: ty = op` (one line, with an optional comment).
    fn def(&self, out: &mut String, v: Value, def: &ValueDef) {
        let (op, comment) = self.op(def);
        let _ = write!(out, "%{}: {} = {op}", v.index(), def.ty);
        if let Some(c) = comment {
            let _ = write!(out, "  // {c}");
        }
        out.push('\n');
    }

    /// Values in the arena that no statement defines: every value without a `Let`, except a
    /// `for` index whose definition is the usual `u32 loop_index` (its header defines it).
    fn unused(&self, out: &mut String) {
        let loop_index = ValueDef {
            op: Op::LoopIndex,
            ty: ScalarType::U32,
        };
        let mut first = true;
        for (v, def) in self.k.values.iter() {
            let i = v.index();
            if self.let_defined.contains(&i)
                || (self.for_indices.contains(&i) && *def == loop_index)
            {
                continue;
            }
            if first {
                out.push_str("unused {\n");
                first = false;
            }
            out.push_str("  ");
            self.def(out, v, def);
        }
        if !first {
            out.push_str("}\n");
        }
    }

    /// The op's text and an optional comment (the decimal value of an `f32` constant).
    fn op(&self, def: &ValueDef) -> (String, Option<String>) {
        let v = |v: &Value| format!("%{}", v.index());
        let text = match &def.op {
            Op::WorkItem => "work_item".to_string(),
            Op::LoopIndex => "loop_index".to_string(),
            Op::Param(p) => format!("param {}", self.param(*p)),
            Op::Const(c) => {
                let lit = scalar_literal(*c);
                let comment = matches!(c, Scalar::F32(_)).then(|| f32_comment(c.bits()));
                let text = if c.ty() == def.ty {
                    format!("const {lit}")
                } else {
                    format!("const {} {lit}", c.ty())
                };
                return (text, comment);
            }
            Op::ReadVar(var) => format!("read_var {}", reference(&self.vars, var.index())),
            Op::Load { buf, index } => format!("load {}[{}]", self.param(*buf), v(index)),
            Op::Lookup { table, index } => {
                format!(
                    "lookup {}[{}]",
                    reference(&self.tables, table.index()),
                    v(index)
                )
            }
            Op::SearchSorted { table, value } => format!(
                "search_sorted {}, {}",
                reference(&self.tables, table.index()),
                v(value)
            ),
            Op::Unary(u, a) => format!("{} {}", u.name(), v(a)),
            Op::Binary(b, x, y) => format!("{} {}, {}", b.name(), v(x), v(y)),
            Op::Fma(a, b, c) => format!("fma {}, {}, {}", v(a), v(b), v(c)),
            Op::Cmp(c, x, y) => format!("cmp {} {}, {}", c.name(), v(x), v(y)),
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                format!("select {}, {}, {}", v(cond), v(if_true), v(if_false))
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => {
                format!("float_to_int {to} {} {}", rounding.name(), v(value))
            }
            Op::IntToFloat { value, rounding } => {
                format!("int_to_float {} {}", rounding.name(), v(value))
            }
            Op::Bitcast { value, to } => format!("bitcast {to} {}", v(value)),
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => {
                let kind = match kind {
                    ReduceKind::Sum => "sum".to_string(),
                    ReduceKind::AbsMax(NanMode::Propagate) => "absmax propagate".to_string(),
                    ReduceKind::AbsMax(NanMode::Ignore) => "absmax ignore".to_string(),
                };
                let order = order_text(*order);
                format!(
                    "reduce {kind} {order} {}[{}, len {}]",
                    self.param(*buf),
                    v(start),
                    v(len)
                )
            }
        };
        (text, None)
    }
}

/// A constant's literal: `f32` as hex bits, integers in decimal, `bool` as `true`/`false`.
fn scalar_literal(c: Scalar) -> String {
    match c {
        Scalar::F32(b) => format!("0x{b:08x}"),
        Scalar::U32(x) => x.to_string(),
        Scalar::I32(x) => x.to_string(),
        Scalar::Bool(b) => b.to_string(),
    }
}

/// A table element: integers in decimal, `f32` (and the invalid `bool`) as hex bits.
fn table_elem(ty: ScalarType, bits: u32) -> String {
    match ty {
        ScalarType::U32 | ScalarType::I32 => scalar_literal(Scalar::from_bits(ty, bits)),
        ScalarType::F32 | ScalarType::Bool => format!("0x{bits:08x}"),
    }
}
