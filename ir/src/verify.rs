//! The verifier: collects every rule a kernel breaks (types, shapes, handles, access, scoping).
//! Backends accept only kernels that pass it.

use std::collections::HashSet;

use crate::error::{Error, Result, VerifyError};
use crate::kernel::{infer_type, Dim, Kernel, ParamKind, Stmt, Value};
use crate::ops::Op;
use crate::types::{Rounding, ScalarType};

/// Checks `kernel` and returns all problems at once.
///
/// Rules: names are identifiers and unique per namespace; shape and grid dims are constants or
/// `u32` scalar parameters; tables are non-empty and not `bool`; every value is defined by exactly
/// one `Let` (or one `for` index) before any use, in the same or an enclosing block; every op's
/// operands have the types it needs and the recorded type equals the inferred one; stores go to
/// writable buffers with the dtype's value type and a rounding exactly for `f16`/`bf16` (only
/// `rne` is supported so far); `if` conditions are `bool`; loop bounds are `u32`, steps at least 1.
///
/// # Errors
/// [`Error::Verify`] listing every problem with its location.
pub fn verify(kernel: &Kernel) -> Result<()> {
    let mut v = Verifier {
        kernel,
        errors: Vec::new(),
        defined: HashSet::new(),
        scopes: vec![Vec::new()],
    };
    v.check_decls();
    v.block(&kernel.body, "body");
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Verify {
            kernel: kernel.name.clone(),
            errors: v.errors,
        })
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

struct Verifier<'k> {
    kernel: &'k Kernel,
    errors: Vec<VerifyError>,
    /// Values defined anywhere so far (each may be defined once).
    defined: HashSet<Value>,
    /// Values visible in the current block and its parents.
    scopes: Vec<Vec<Value>>,
}

impl Verifier<'_> {
    fn error(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.errors.push(VerifyError {
            location: location.into(),
            message: message.into(),
        });
    }

    fn check_dim(&mut self, d: &Dim, location: &str) {
        if let Dim::Param(p) = d {
            match self.kernel.params.try_get(*p).map(|p| &p.kind) {
                Some(ParamKind::Scalar(ScalarType::U32)) => {}
                Some(_) => self.error(location, "a symbolic dim must name a u32 scalar parameter"),
                None => self.error(
                    location,
                    format!("dim names parameter #{} which does not exist", p.index()),
                ),
            }
        }
    }

    fn check_decls(&mut self) {
        let k = self.kernel;
        if !is_ident(&k.name) {
            self.error(
                "kernel",
                format!("kernel name '{}' is not an identifier", k.name),
            );
        }
        let mut names = HashSet::new();
        for (_, p) in k.params.iter() {
            let loc = format!("param '{}'", p.name);
            if !is_ident(&p.name) {
                self.error(&loc, "parameter name is not an identifier");
            }
            if !names.insert(p.name.as_str()) {
                self.error(&loc, "duplicate parameter name");
            }
            match &p.kind {
                ParamKind::Scalar(ScalarType::Bool) => {
                    self.error(&loc, "scalar parameters cannot be bool")
                }
                ParamKind::Scalar(_) => {}
                ParamKind::Buffer { shape, .. } => {
                    if shape.is_empty() {
                        self.error(&loc, "a buffer needs at least one dim");
                    }
                    for d in shape {
                        self.check_dim(d, &loc);
                    }
                }
            }
        }
        self.check_dim(&k.grid, "grid");
        let mut names = HashSet::new();
        for (_, t) in k.tables.iter() {
            let loc = format!("table '{}'", t.name);
            if !is_ident(&t.name) || !names.insert(t.name.as_str()) {
                self.error(&loc, "table name is not a unique identifier");
            }
            if t.data.is_empty() {
                self.error(&loc, "a table needs at least one element");
            }
            if t.ty == ScalarType::Bool {
                self.error(&loc, "tables cannot be bool");
            }
        }
        let mut names = HashSet::new();
        for (_, var) in k.vars.iter() {
            if !is_ident(&var.name) || !names.insert(var.name.as_str()) {
                self.error(
                    format!("var '{}'", var.name),
                    "variable name is not a unique identifier",
                );
            }
        }
    }

    fn visible(&self, v: Value) -> bool {
        self.scopes.iter().any(|s| s.contains(&v))
    }

    /// Checks that `v` exists and is visible here; returns its type.
    fn use_value(&mut self, v: Value, loc: &str) -> Option<ScalarType> {
        let Some(def) = self.kernel.values.try_get(v) else {
            self.error(loc, format!("value %{} does not exist", v.index()));
            return None;
        };
        if !self.visible(v) {
            self.error(
                loc,
                format!(
                    "%{} is used before its definition or outside its block",
                    v.index()
                ),
            );
        }
        Some(def.ty)
    }

    fn expect(&mut self, v: Value, ty: ScalarType, what: &str, loc: &str) {
        if let Some(t) = self.use_value(v, loc) {
            if t != ty {
                self.error(
                    loc,
                    format!("{what} must be {ty}, got {t} (%{})", v.index()),
                );
            }
        }
    }

    fn define(&mut self, v: Value, loc: &str) {
        if !self.defined.insert(v) {
            self.error(loc, format!("%{} is defined more than once", v.index()));
        }
        self.scopes.last_mut().expect("scope").push(v);
    }

    fn block(&mut self, stmts: &[Stmt], path: &str) {
        for (i, stmt) in stmts.iter().enumerate() {
            let loc = format!("{path}[{i}]");
            self.stmt(stmt, &loc);
        }
    }

    fn nested(&mut self, stmts: &[Stmt], path: &str, index: Option<Value>) {
        self.scopes.push(Vec::new());
        if let Some(index) = index {
            self.define(index, path);
        }
        self.block(stmts, path);
        self.scopes.pop();
    }

    fn stmt(&mut self, stmt: &Stmt, loc: &str) {
        let k = self.kernel;
        match stmt {
            Stmt::Let(v) => {
                let Some(def) = k.values.try_get(*v) else {
                    self.error(
                        loc,
                        format!("let of value %{} which does not exist", v.index()),
                    );
                    return;
                };
                let loc = format!("{loc} (%{})", v.index());
                if def.op == Op::LoopIndex {
                    self.error(&loc, "a loop index can only be defined by a for statement");
                }
                for operand in def.op.operands() {
                    self.use_value(operand, &loc);
                }
                if def
                    .op
                    .operands()
                    .iter()
                    .all(|o| k.values.try_get(*o).is_some())
                {
                    match infer_type(k, &def.op) {
                        Ok(t) if t == def.ty => {}
                        Ok(t) => self.error(
                            &loc,
                            format!("recorded type {} but the op yields {t}", def.ty),
                        ),
                        Err(msg) => self.error(&loc, msg),
                    }
                }
                self.define(*v, &loc);
            }
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => {
                self.expect(*index, ScalarType::U32, "store index", loc);
                let vty = self.use_value(*value, loc);
                match k.params.try_get(*buf) {
                    None => self.error(
                        loc,
                        format!("store to parameter #{} which does not exist", buf.index()),
                    ),
                    Some(p) => {
                        match &p.kind {
                            ParamKind::Scalar(_) => {
                                self.error(loc, format!("store to scalar parameter '{}'", p.name))
                            }
                            ParamKind::Buffer { dtype, access, .. } => {
                                if !access.can_write() {
                                    self.error(
                                        loc,
                                        format!("store to read-only buffer '{}'", p.name),
                                    );
                                }
                                if let Some(t) = vty {
                                    if t != dtype.value_type() {
                                        self.error(
                                            loc,
                                            format!(
                                                "store of {t} into {dtype} buffer '{}' (needs {})",
                                                p.name,
                                                dtype.value_type()
                                            ),
                                        );
                                    }
                                }
                                match (dtype.is_narrow_float(), rounding) {
                                (true, None) => self.error(loc, format!("store into {dtype} buffer '{}' needs a rounding", p.name)),
                                (true, Some(Rounding::NearestEven)) | (false, None) => {}
                                (true, Some(r)) => self.error(loc, format!("rounding {} to {dtype} is not supported yet (only rne)", r.name())),
                                (false, Some(_)) => self.error(loc, format!("store into {dtype} buffer '{}' takes no rounding", p.name)),
                            }
                            }
                        }
                    }
                }
            }
            Stmt::Assign { var, value } => {
                let vty = self.use_value(*value, loc);
                match k.vars.try_get(*var) {
                    None => self.error(
                        loc,
                        format!("assign to variable #{} which does not exist", var.index()),
                    ),
                    Some(var) => {
                        if let Some(t) = vty {
                            if t != var.ty {
                                self.error(
                                    loc,
                                    format!("assign of {t} to {} variable '{}'", var.ty, var.name),
                                );
                            }
                        }
                    }
                }
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                self.expect(*cond, ScalarType::Bool, "if condition", loc);
                self.nested(then_body, &format!("{loc}.then"), None);
                self.nested(else_body, &format!("{loc}.else"), None);
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => {
                self.expect(*start, ScalarType::U32, "loop start", loc);
                self.expect(*end, ScalarType::U32, "loop end", loc);
                if *step == 0 {
                    self.error(loc, "loop step must be at least 1");
                }
                match k.values.try_get(*index) {
                    Some(def) if def.op == Op::LoopIndex && def.ty == ScalarType::U32 => {}
                    Some(_) => self.error(
                        loc,
                        format!(
                            "loop index %{} must be a u32 loop_index value",
                            index.index()
                        ),
                    ),
                    None => {
                        self.error(loc, format!("loop index %{} does not exist", index.index()));
                        return;
                    }
                }
                self.nested(body, &format!("{loc}.body"), Some(*index));
            }
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => {
                self.expect(*len, ScalarType::U32, "accumulate len", loc);
                if let crate::ops::ReduceOrder::Strided(w) = order {
                    if !(2..=64).contains(w) || !w.is_power_of_two() {
                        self.error(
                            loc,
                            format!(
                                "strided accumulate needs a power of two in 2..=64 ways, got {w}"
                            ),
                        );
                    }
                }
                match k.values.try_get(*index) {
                    Some(def) if def.op == Op::LoopIndex && def.ty == ScalarType::U32 => {}
                    _ => {
                        self.error(
                            loc,
                            format!(
                                "accumulate index %{} must be a u32 loop_index value",
                                index.index()
                            ),
                        );
                        return;
                    }
                }
                if accs.is_empty() {
                    self.error(loc, "accumulate needs at least one accumulator");
                }
                let path = format!("{loc}.body");
                self.scopes.push(Vec::new());
                self.define(*index, &path);
                for (i, stmt) in body.iter().enumerate() {
                    if !matches!(stmt, Stmt::Let(_)) {
                        self.error(
                            format!("{path}[{i}]"),
                            "an accumulate body holds only let statements",
                        );
                    }
                }
                self.block(body, &path);
                for (i, acc) in accs.iter().enumerate() {
                    let aloc = format!("{loc}.acc[{i}]");
                    self.expect(acc.a, ScalarType::F32, "accumulate factor", &aloc);
                    self.expect(acc.b, ScalarType::F32, "accumulate factor", &aloc);
                    match k.vars.try_get(acc.var) {
                        None => self.error(
                            &aloc,
                            format!(
                                "accumulate into variable #{} which does not exist",
                                acc.var.index()
                            ),
                        ),
                        Some(var) if var.ty != ScalarType::F32 => self.error(
                            &aloc,
                            format!(
                                "accumulate into {} variable '{}' (needs f32)",
                                var.ty, var.name
                            ),
                        ),
                        Some(_) => {}
                    }
                }
                self.scopes.pop();
            }
        }
    }
}
