//! Statements and ops of the text form: the kernel body and the `unused` section.

use super::{Parser, MAX_DEPTH};
use crate::error::Result;
use crate::handle::Handle;
use crate::kernel::{Accum, ParamId, Stmt, Value, ValueDef};
use crate::ops::{BinaryOp, CmpOp, NanMode, Op, ReduceKind, ReduceOrder, UnaryOp};
use crate::text::lexer::Tok;
use crate::types::{Rounding, ScalarType};

impl Parser {
    // ----- statements and ops -----

    /// `'{' {stmt} '}'`, the block at verifier path `path` (`body`, `body[3].then`, ...):
    /// records the line of each statement (`path[i]`).
    pub(super) fn block(&mut self, path: &str) -> Result<Vec<Stmt>> {
        let open = self.peek().clone();
        self.punct("{", "to open a block")?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Self::error_at(
                open.line,
                open.col,
                format!("blocks are nested more than {MAX_DEPTH} deep"),
            ));
        }
        let mut stmts = Vec::new();
        while !self.is_punct("}") {
            let at = format!("{path}[{}]", stmts.len());
            self.stmt_lines.insert(at.clone(), self.peek().line);
            stmts.push(self.stmt(&at)?);
        }
        self.bump();
        self.depth -= 1;
        Ok(stmts)
    }

    /// The statement at verifier path `at`.
    fn stmt(&mut self, at: &str) -> Result<Stmt> {
        const WHAT: &str =
            "a statement ('%N: type = op', let, store, assign, if, for, accumulate) or '}'";
        let t = self.peek().clone();
        let kw = match &t.tok {
            Tok::Value(_) => return Ok(Stmt::Let(self.def()?)),
            Tok::Ident(s) => s.clone(),
            _ => return Err(self.expected(WHAT)),
        };
        match kw.as_str() {
            "let" => {
                self.bump();
                Ok(Stmt::Let(self.value("the value to evaluate")?))
            }
            "store" => {
                self.bump();
                let r = self.reference("a buffer parameter")?;
                let buf = Self::resolve(&self.param_names, r, "parameter")?;
                self.punct("[", "after the store's buffer")?;
                let index = self.value("the store index")?;
                self.punct("]", "after the store index")?;
                self.punct("=", "after 'store buf[%i]'")?;
                let value = self.value("the value to store")?;
                let rounding = match &self.peek().tok {
                    Tok::Ident(w) if Rounding::from_name(w).is_some() => Some(self.rounding()?),
                    _ => None,
                };
                Ok(Stmt::Store {
                    buf,
                    index,
                    value,
                    rounding,
                })
            }
            "assign" => {
                self.bump();
                let r = self.reference("a variable")?;
                let var = Self::resolve(&self.var_names, r, "variable")?;
                self.punct("=", "after the assigned variable")?;
                let value = self.value("the assigned value")?;
                Ok(Stmt::Assign { var, value })
            }
            "if" => {
                self.bump();
                let cond = self.value("the if condition")?;
                let then_body = self.block(&format!("{at}.then"))?;
                let else_body = if self.is_keyword("else") {
                    self.bump();
                    self.block(&format!("{at}.else"))?
                } else {
                    Vec::new()
                };
                Ok(Stmt::If {
                    cond,
                    then_body,
                    else_body,
                })
            }
            "for" => {
                self.bump();
                let index = self.value("the loop index")?;
                self.for_indices.insert(index.index() as u32);
                self.keyword("in", "after the loop index")?;
                let start = self.value("the loop start")?;
                self.punct("..", "between the loop bounds")?;
                let end = self.value("the loop end")?;
                self.keyword("step", "after the loop bounds")?;
                let step = self.u32_number("the loop step")?;
                let body = self.block(&format!("{at}.body"))?;
                Ok(Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body,
                })
            }
            "accumulate" => {
                self.bump();
                let index = self.value("the accumulate index")?;
                self.for_indices.insert(index.index() as u32);
                self.keyword("len", "after the accumulate index")?;
                let len = self.value("the accumulate length")?;
                let order = self.reduce_order()?;
                let body = self.block(&format!("{at}.body"))?;
                self.keyword("into", "after the accumulate body")?;
                let mut accs = Vec::new();
                loop {
                    let r = self.reference("an accumulator variable")?;
                    let var = Self::resolve(&self.var_names, r, "variable")?;
                    self.punct("(", "after the accumulator variable")?;
                    let a = self.value("the first factor")?;
                    self.punct(",", "between the factors")?;
                    let b = self.value("the second factor")?;
                    self.punct(")", "after the factors")?;
                    accs.push(Accum { var, a, b });
                    if !self.is_punct(",") {
                        break;
                    }
                    self.bump();
                }
                Ok(Stmt::Accumulate {
                    index,
                    len,
                    order,
                    body,
                    accs,
                })
            }
            _ => Err(self.expected(WHAT)),
        }
    }

    /// `sequential` or `strided N`.
    fn reduce_order(&mut self) -> Result<ReduceOrder> {
        let (o, line, col) = self.word("a reduction order (sequential or strided N)")?;
        match o.as_str() {
            "sequential" => Ok(ReduceOrder::Sequential),
            "strided" => Ok(ReduceOrder::Strided(
                self.u32_number("the number of strided ways")?,
            )),
            _ => Err(Self::error_at(
                line,
                col,
                format!("expected a reduction order (sequential or strided N), found '{o}'"),
            )),
        }
    }

    /// `%N: type = op`: records the definition and returns the value.
    pub(super) fn def(&mut self) -> Result<Value> {
        let t = self.peek().clone();
        let v = self.value("a value definition")?;
        self.punct(":", "after the defined value")?;
        let ty = self.scalar_type("the value type")?;
        self.punct("=", "after the value type")?;
        let op = self.op(ty)?;
        let def = ValueDef { op, ty };
        let n = v.index() as u32;
        match self.defs.get(&n) {
            Some((old, _, _)) if *old != def => {
                return Err(Self::error_at(
                    t.line,
                    t.col,
                    format!("conflicting definitions of %{n}"),
                ));
            }
            Some(_) => {}
            None => {
                self.defs.insert(n, (def, t.line, t.col));
            }
        }
        Ok(v)
    }

    fn param_ref(&mut self, what: &str) -> Result<ParamId> {
        let r = self.reference(what)?;
        Self::resolve(&self.param_names, r, "parameter")
    }

    /// `ref '[' value ',' 'len' value ']'` of a reduction.
    fn reduce_range(&mut self) -> Result<(ParamId, Value, Value)> {
        let buf = self.param_ref("the reduced buffer")?;
        self.punct("[", "after the reduced buffer")?;
        let start = self.value("the reduce start")?;
        self.punct(",", "after the reduce start")?;
        self.keyword("len", "before the reduce length")?;
        let len = self.value("the reduce length")?;
        self.punct("]", "after the reduce length")?;
        Ok((buf, start, len))
    }

    /// Two or three comma-separated operands.
    fn operands<const N: usize>(&mut self, op: &str) -> Result<[Value; N]> {
        let mut out = [Handle::from_index(0); N];
        for (i, slot) in out.iter_mut().enumerate() {
            if i > 0 {
                self.punct(",", &format!("between the operands of {op}"))?;
            }
            *slot = self.value(&format!("operand {} of {op}", i + 1))?;
        }
        Ok(out)
    }

    /// An op; `ty` is the defined value's type (the default type of a `const`).
    fn op(&mut self, ty: ScalarType) -> Result<Op> {
        let (w, line, col) = self.word("an op name")?;
        if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == w) {
            return Ok(Op::Unary(u, self.value(&format!("the operand of {w}"))?));
        }
        if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == w) {
            let [x, y] = self.operands(&w)?;
            return Ok(Op::Binary(b, x, y));
        }
        Ok(match w.as_str() {
            "work_item" => Op::WorkItem,
            "loop_index" => Op::LoopIndex,
            "param" => Op::Param(self.param_ref("a scalar parameter")?),
            "const" => {
                let explicit = match &self.peek().tok {
                    Tok::Ident(t) => ScalarType::from_name(t),
                    _ => None,
                };
                if explicit.is_some() {
                    self.bump();
                }
                Op::Const(self.literal(explicit.unwrap_or(ty), "the constant")?)
            }
            "read_var" => {
                let r = self.reference("a variable")?;
                Op::ReadVar(Self::resolve(&self.var_names, r, "variable")?)
            }
            "load" => {
                let buf = self.param_ref("a buffer parameter")?;
                self.punct("[", "after the loaded buffer")?;
                let index = self.value("the load index")?;
                self.punct("]", "after the load index")?;
                Op::Load { buf, index }
            }
            "lookup" => {
                let r = self.reference("a table")?;
                let table = Self::resolve(&self.table_names, r, "table")?;
                self.punct("[", "after the table")?;
                let index = self.value("the lookup index")?;
                self.punct("]", "after the lookup index")?;
                Op::Lookup { table, index }
            }
            "search_sorted" => {
                let r = self.reference("a table")?;
                let table = Self::resolve(&self.table_names, r, "table")?;
                self.punct(",", "after the searched table")?;
                let value = self.value("the searched value")?;
                Op::SearchSorted { table, value }
            }
            "fma" => {
                let [a, b, c] = self.operands("fma")?;
                Op::Fma(a, b, c)
            }
            "cmp" => {
                let (c, line, col) = self.word("a comparison (eq, ne, lt, le, gt or ge)")?;
                let Some(c) = CmpOp::ALL.into_iter().find(|o| o.name() == c) else {
                    return Err(Self::error_at(
                        line,
                        col,
                        format!("expected a comparison (eq, ne, lt, le, gt or ge), found '{c}'"),
                    ));
                };
                let [x, y] = self.operands("cmp")?;
                Op::Cmp(c, x, y)
            }
            "select" => {
                let [cond, if_true, if_false] = self.operands("select")?;
                Op::Select {
                    cond,
                    if_true,
                    if_false,
                }
            }
            "float_to_int" => {
                let to = self.scalar_type("the float_to_int target type")?;
                let rounding = self.rounding()?;
                Op::FloatToInt {
                    value: self.value("the float_to_int operand")?,
                    to,
                    rounding,
                }
            }
            "int_to_float" => {
                let rounding = self.rounding()?;
                Op::IntToFloat {
                    value: self.value("the int_to_float operand")?,
                    rounding,
                }
            }
            "bitcast" => {
                let to = self.scalar_type("the bitcast target type")?;
                Op::Bitcast {
                    value: self.value("the bitcast operand")?,
                    to,
                }
            }
            "reduce" => {
                let (k, line, col) = self.word("a reduction kind (sum or absmax)")?;
                let kind = match k.as_str() {
                    "sum" => ReduceKind::Sum,
                    "absmax" => {
                        let (m, line, col) = self.word("a NaN mode (propagate or ignore)")?;
                        match m.as_str() {
                            "propagate" => ReduceKind::AbsMax(NanMode::Propagate),
                            "ignore" => ReduceKind::AbsMax(NanMode::Ignore),
                            _ => {
                                return Err(Self::error_at(
                                    line,
                                    col,
                                    format!(
                                        "expected a NaN mode (propagate or ignore), found '{m}'"
                                    ),
                                ))
                            }
                        }
                    }
                    _ => {
                        return Err(Self::error_at(
                            line,
                            col,
                            format!("expected a reduction kind (sum or absmax), found '{k}'"),
                        ))
                    }
                };
                let order = self.reduce_order()?;
                let (buf, start, len) = self.reduce_range()?;
                Op::Reduce {
                    kind,
                    buf,
                    start,
                    len,
                    order,
                }
            }
            _ => return Err(Self::error_at(line, col, format!("unknown op '{w}'"))),
        })
    }
}
